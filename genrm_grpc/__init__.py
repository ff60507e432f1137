"""genrm-grpc: group-relative rewards from a generative reward model judge, over gRPC."""
