"""Model loading (GGUF conversion, mmap weights, tokenizer) and the Llama forward."""
