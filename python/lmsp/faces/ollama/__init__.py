"""The Ollama-compatible face (`/api`): chat, generate, embeddings and the model list as Ollama's
clients speak them, over the same services as the other faces. Routes in `routes`, requests
as plans in `translate`, answers (NDJSON streams included) in `reply`, model facts in `models`
and `gguf`, error bodies in `errors`, OpenAPI operations in `openapi`."""
