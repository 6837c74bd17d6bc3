"""The payments HTTP API: the provider's webhook endpoint."""
