// Package checkpointpb is the payload of pleg-nri's checkpoint file (pleg/checkpoint_codec.go):
// checkpoint.pb.go is generated from checkpoint.proto by make generate, and committed; make
// generate-check fails when they differ.
package checkpointpb
