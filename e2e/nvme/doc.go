// Package nvme holds the NVMe/TCP VM tier of the test suite (make
// e2e-nvme, build tag nvmevm): see nvme_test.go.
package nvme
