"""The toy Cosmos3: a small checkpoint trained on CPU so the demo renders pictures that match their prompts.

``layout`` writes a checkpoint in the published directory layout (shared with the tests' tiny random
checkpoint), ``scenes`` draws the coloured-shape scenes and their captions, ``measure`` reads a render
back from its pixels (colour, position, motion), ``flow`` is the batched flow-matching forward the
trainer (``scripts/train_toy.py``) runs on diffusers' ``Cosmos3OmniTransformer``.
"""
