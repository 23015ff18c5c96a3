// Package funclen holds only a test: it keeps every production function in
// events/ and services/ short enough to read in one sitting (issue 15). The
// one exception is the fold's type switch, which reads best as one list of
// cases.
package funclen
