"""The LMSP face: `/lmsp/v1/…`, the protocol this service is built for (docs/PROFILE.md)."""
