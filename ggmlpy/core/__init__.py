"""The lowest layer: element types, tensors and contexts, graphs, op codes, errors, the
change snapshots every cache validates against, argument checks and the ``GGMLPY_*``
environment variables. Nothing here knows about buffers' contents or backends.
"""
