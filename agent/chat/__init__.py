"""Chatting with the local agent: the endpoint it serves on loopback, its protocol, and a client."""
