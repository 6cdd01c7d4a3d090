"""Where tinyzoo keeps what it makes (converted and synthetic models, file hashes, the CPU thread pool): one cache
directory, ~/.cache/tinyzoo unless TINYZOO_CACHE names another."""
import os
from pathlib import Path

def cache_dir() -> Path:
  return Path(os.environ.get("TINYZOO_CACHE", Path.home() / ".cache" / "tinyzoo"))
