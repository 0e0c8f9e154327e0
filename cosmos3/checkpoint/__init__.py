"""A checkpoint into the model: the tensor reader, the strict fill of the transformer's weights, the transformer's
load, and the ModelOpt export that writes the static-FP8 checkpoints (``python -m cosmos3.checkpoint.fp8_export``).

What the files hold is read from their headers by ``cosmos3.rules.checkpoint_header`` (torch-free, shared with
``farm validate``).
"""
