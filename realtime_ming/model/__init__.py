"""Pure PyTorch Ming-flash-omni-2.0 modules, configs and weight loading (no serving concerns)."""
