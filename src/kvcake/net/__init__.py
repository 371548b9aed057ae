"""Server plumbing shared by every process: the framed-TCP server loop, the HTTP server thread, listening sockets."""
