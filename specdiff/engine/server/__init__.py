"""The server backend: a lane streamed from an OpenAI-compatible server or llama-server
(lane), its HTTP client (client), API dialects (dialects), token ids (vocab) and local
llama-server processes (process)."""
