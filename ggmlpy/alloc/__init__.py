"""Memory planning (ggml-alloc.c): the tensor allocator (tallocr), the graph allocator
(gallocr) and its dynamic address planner.
"""
