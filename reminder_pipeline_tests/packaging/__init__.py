"""What gets installed: declared dependencies, the hash-checked locks, a plain production install."""
