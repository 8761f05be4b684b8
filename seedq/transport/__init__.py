"""How seedq's processes reach each other: the actors' gRPC channel, its TLS and
token credentials and who may connect (channel), the certificates `seedq certs`
makes (certs), and an emulated network delay for the benches (netdelay). The
servers that answer are in seedq.server and seedq.impala."""
