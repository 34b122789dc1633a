"""The head of a conversation: tokenizer and chat template, sampling, the generation loop."""
