// Package bytesize reads and prints sizes in configuration: "512MiB",
// "10GiB", "1TB" or plain bytes. It stands apart from the config package
// so that backends' settings (vz memory) can use it without importing the
// config that decodes them.
package bytesize

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Size is a size in bytes; YAML gives it as an integer or with a unit:
// "512MiB", "10GiB", "1TB" (KB, MB, GB, TB are powers of 1000; KiB, MiB,
// GiB, TiB of 1024).
type Size int64

// UnmarshalYAML implements yaml.Unmarshaler.
func (b *Size) UnmarshalYAML(n *yaml.Node) error {
	s := strings.TrimSpace(n.Value)
	units := []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
		{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1}}
	mult := int64(1)
	for _, u := range units {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.mult
			break
		}
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 0 || (v > 0 && mult > math.MaxInt64/v) {
		return fmt.Errorf("size %q: give bytes or a whole number with KiB, MiB, GiB, TiB (or KB, MB, GB, TB)", n.Value)
	}
	*b = Size(v * mult)
	return nil
}

// String prints the size in the largest binary unit that divides it.
func (b Size) String() string {
	for _, u := range []struct {
		suffix string
		mult   Size
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if b != 0 && b%u.mult == 0 {
			return strconv.FormatInt(int64(b/u.mult), 10) + u.suffix
		}
	}
	return strconv.FormatInt(int64(b), 10) + "B"
}
