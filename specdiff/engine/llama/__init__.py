"""The in-process backend on llama.cpp's low-level API: handles (context), the decode
loop (lane), draft sources (drafts) and one prompt among others in a batch (batched)."""
