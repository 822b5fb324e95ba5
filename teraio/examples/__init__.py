"""Example training scripts shipped with teraio (plain PyTorch: they never import teraio)."""
