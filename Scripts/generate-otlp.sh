#!/bin/sh
# Makes Sources/OTLPLogs/otlp_logs.pb.swift from Protos/otlp_logs.proto, with protoc (Debian's
# protobuf-compiler) and the protoc-gen-swift of the swift-protobuf version Package.swift names.
# The output is committed, so that a build never needs protoc or the plugin: run this only after
# changing the .proto.
set -eu
cd "$(dirname "$0")/.."
command -v protoc >/dev/null || { echo "protoc is missing: apt-get install -y protobuf-compiler" >&2; exit 1; }
swift build -c release --product protoc-gen-swift --package-path .build/checkouts/swift-protobuf \
    --scratch-path .build/protoc-gen-swift
protoc --plugin=protoc-gen-swift=.build/protoc-gen-swift/release/protoc-gen-swift \
    --swift_opt=Visibility=Package --swift_out=Sources/OTLPLogs -I Protos Protos/otlp_logs.proto
