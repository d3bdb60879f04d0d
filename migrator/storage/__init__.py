"""Where bytes land: atomic files and folders, paths, object-store URLs."""
