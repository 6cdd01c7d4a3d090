"""The parts of models.tokenizer: GGUF vocabulary metadata, pre-tokenizers, the SentencePiece and BPE engines, chat templates."""
