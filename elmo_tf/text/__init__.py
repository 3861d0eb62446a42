"""Text to ids: the character ids of tokens and the word vocabulary."""
