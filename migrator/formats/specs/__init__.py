"""The built-in formats' declarations, one module each (`FormatSpec`, `formats/spec.py`), in the order
the registry lists them. Each is standard library only: the codec it names is imported when first used."""
