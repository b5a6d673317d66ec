"""What a model is: GGUF facts from headers, discovery, names, pulling."""
