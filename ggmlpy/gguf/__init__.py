"""GGUF files: reading and writing weights in ggml's file format.
"""
