"""The accounting and forensics index: the log folded into SQLite, and the service that answers from it."""
