package nvme

import "errors"

// Sentinel errors. The CSI layer maps them to gRPC codes with errors.Is.
var (
	// ErrInvalidArgument: an NQN, address, port or configuration value failed
	// validation; nothing was done.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrForeignNQN: the NQN does not start with this driver's prefix, so this
	// package refuses to act on it.
	ErrForeignNQN = errors.New("NQN does not belong to this driver")
	// ErrInUse: the caller reported that a staged volume still uses the
	// subsystem; it was left connected.
	ErrInUse = errors.New("subsystem still in use")
	// ErrNotConnected: no controller (or loop device) exists for the NQN.
	ErrNotConnected = errors.New("not connected")
	// ErrNoDevice: the subsystem is connected but no usable namespace block
	// device exists (yet).
	ErrNoDevice = errors.New("no namespace block device")
	// ErrTargetUnreachable: the kernel could not reach the target (refused,
	// timed out, no route). Worth retrying.
	ErrTargetUnreachable = errors.New("NVMe/TCP target unreachable")
	// ErrSubsystemNotFound: the target refused the connect and its
	// discovery log does not list the NQN for this host: the volume is not
	// exported there (or not to this host).
	ErrSubsystemNotFound = errors.New("NVMe subsystem not offered by the target")
	// ErrOtherTarget: the subsystem NQN is connected already, to another
	// target (another address or port): another disk under the same NQN.
	// It is left alone and not used.
	ErrOtherTarget = errors.New("NVMe subsystem NQN connected to another target")
	// ErrConnectFailed: the kernel refused the connect for another reason
	// (see the node's kernel log).
	ErrConnectFailed = errors.New("NVMe/TCP connect failed")
	// ErrAuthUnsupported: the target needs NVMe in-band authentication and
	// this node's kernel cannot do it; nothing was attempted.
	ErrAuthUnsupported = errors.New("the kernel has no NVMe in-band authentication")
	// ErrAuthFailed: the target requires NVMe in-band authentication
	// (DH-HMAC-CHAP) and refused this host's: no secret, or not the
	// secret the export holds now (a wrong one, or an earlier attachment's
	// after a fence replaced it). Retrying with the same secret cannot
	// succeed.
	ErrAuthFailed = errors.New("NVMe in-band authentication refused")
	// ErrMalformedSecret wraps every reason ParseDHCHAPSecret refuses a value.
	ErrMalformedSecret = errors.New("malformed DH-HMAC-CHAP secret")
)
