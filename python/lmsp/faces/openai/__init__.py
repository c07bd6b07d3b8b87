"""The OpenAI-compatible face (`/v1`): Responses and Chat Completions as a second view of the
same services, EventLog and store as the LMSP routes (DESIGN.md, "Faces over one service").
Routes in `routes`, request schemas in `schema`, translation in `translate` and `chat`, the
event projection in `projection`, error objects in `errors`."""
