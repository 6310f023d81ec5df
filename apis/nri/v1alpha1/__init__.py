"""Generated protocol modules; see the .proto files and scripts/gen_protos.sh."""
