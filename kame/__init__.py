"""kame: a KAME tandem voice assistant server (Moshi front-end + any text LLM)."""

__version__ = "0.1.0"
