// Command schemagen writes schemas/ from the events catalogue:
// `go run ./services/cmd/schemagen schemas` (make schemas).
package main

import (
	"fmt"
	"os"

	"github.com/berth-ci/berth/services/schemagen"
)

func main() {
	dir := "schemas"
	if len(os.Args) > 1 {
		dir = os.Args[1]
	}
	if err := schemagen.Write(dir); err != nil {
		fmt.Fprintln(os.Stderr, "schemagen:", err)
		os.Exit(1)
	}
}
