"""The model's rules without torch: what a checkpoint, a request and the load options may be.

``farm validate`` (on a head node without torch) and the worker call these same functions, so a job that validates
is one a worker renders. Every module here imports only the standard library, yaml/tokenizers, ``cosmos3.errors``
and this package (``tests/cosmos3/test_rules.py`` imports each with torch blocked; ``tests/test_import_graph.py``
checks the imports).
"""
