// Package crosscheck holds only a test: it type-checks the darwin/arm64
// cgo build of the vz backend (and the berth command that links it) on
// any OS, so code that only a Mac compiles cannot rot unseen here.
//
// `GOOS=darwin GOARCH=arm64 CGO_ENABLED=1 go vet` cannot do it off a Mac:
// cgo must run a C compiler that knows Apple's SDK (Virtualization.h,
// Foundation) to translate every file that imports "C", in github.com/
// Code-Hex/vz/v3 and in the backend's detach_darwin.go. go/types can:
// with FakeImportC each `import "C"` declares an empty package and the
// C.xxx references are left unchecked, while everything written in Go
// (every call into the vz module, every type, every build-tagged file) is
// checked against the darwin/arm64 file set go/build selects. What stays
// unchecked is only C: the Objective-C preambles and the C types of the
// values passed to them (make vz-test on a Mac compiles those).
package crosscheck
