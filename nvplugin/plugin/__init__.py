"""The device plugin: gRPC server, kubelet registration, Allocate responses."""
