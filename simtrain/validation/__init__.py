"""Published runs, error tables and likely ranges."""
