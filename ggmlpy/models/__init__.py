"""Real workloads built on ggmlpy (first: all-MiniLM-L6-v2 sentence embeddings)."""
