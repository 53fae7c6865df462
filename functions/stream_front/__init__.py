"""The large-body front: the routes whose request or response bodies API Gateway (10 MB) and
Lambda (6 MB) cannot carry, served by a process that streams them between the connection and S3
(docs/adr/0070-a-streaming-front-for-large-bodies.md)."""
