"""A module that opens a socket when it is imported and keeps it open (say, a metrics client's)."""
import socket

METRICS = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
