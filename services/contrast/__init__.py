"""The contrast service: names the capabilities that separate failed from successful runs."""
