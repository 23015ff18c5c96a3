// Package testkit is what Berth's tests share: waiting on a condition with
// a deadline, an embedded NATS server or a 3-node cluster per test, a
// builder of event histories for given-when-then tests of folds and decide
// functions, a recorder of slog output, a controllable fake VM backend, and
// a checker of import rules.
//
// It is ordinary (non-test) code so that the services module's tests and
// the tests module can both import it; production code never does (a rule
// in rules_test.go).
package testkit
