"""The gRPC front: the listener (listener.py); HTTP/2, the gRPC framing and
the RLS messages run in fastlimit._grpc."""
