"""HTTP: the OpenAI /v1 routes, errors as OpenAI bodies, and the proxy to engine children."""
