"""A model file's sha256, computed once and remembered in the cache directory."""
import hashlib
import os
from ops.cache import cache_dir, write_whole

def file_sha256(path: os.PathLike) -> str:
  """sha256 of a model file, remembered per (path, size, mtime) so a 250 MB file is hashed once."""
  st = os.stat(path)
  memo = cache_dir() / "sha256" / hashlib.sha1(f"{os.path.abspath(path)}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()
  if memo.exists(): return memo.read_text()
  h = hashlib.sha256()
  with open(path, "rb") as f:
    while chunk := f.read(1 << 22): h.update(chunk)
  write_whole(memo, h.hexdigest())
  return h.hexdigest()
