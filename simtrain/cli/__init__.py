"""The command line (``simtrain``; ``python -m simtrain.cli``)."""
