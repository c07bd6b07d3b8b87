"""Who may do what (§10): bearer tokens and their scopes, the local defaults (loopback, Host
names, CORS), and the limits that keep a client from exhausting the service."""
