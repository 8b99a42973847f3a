"""Whole transformers models compiled with the backend."""
