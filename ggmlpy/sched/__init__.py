"""The multi-backend scheduler (ggml_backend_sched in ggml-backend.cpp): assignment passes,
splits, split templates and the unchanged-graph reuse cache.
"""
