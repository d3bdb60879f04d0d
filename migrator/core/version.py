"""Who wrote a file: the package's version and the producer name written into output metadata.

Here, at the bottom, so that a module writing metadata needs nothing above it; `migrator.__version__`
is this value.
"""

__version__ = "0.4.0"
PRODUCER = "migrator"
