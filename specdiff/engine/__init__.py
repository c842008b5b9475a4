"""The engine: lanes that decode (llama/ in-process on llama.cpp, server/ over HTTP) behind
one protocol (base), run in pairs (pairrun) inside a worker process (worker)."""
