"""PyTorch execution traces and Kineto traces: reading, matching, linking."""
