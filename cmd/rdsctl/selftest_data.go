package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/srvlab/rds-csi/pkg/nvme"
)

// dataPath reaches a scratch disk's data the way a node does: connected to
// its export as one host NQN. The self-test uses it to check that a copy
// holds its source's data.
type dataPath interface {
	write(ctx context.Context, nqn, hostNQN string, off int64, p []byte) error
	read(ctx context.Context, nqn, hostNQN string, off int64, n int) ([]byte, error)
	describe() string
}

// nvmeDataPath connects over NVMe/TCP with the kernel's initiator (the
// driver's node code, pkg/nvme), for one read or write at a time, and
// disconnects after it.
type nvmeDataPath struct {
	c       *nvme.TCPConnector
	address string
	port    int
}

func newNVMeDataPath(nqnPrefix, address string, port int) (*nvmeDataPath, error) {
	c, err := nvme.NewTCPConnector(nvme.Config{NQNPrefix: nqnPrefix, CtrlLossTimeout: 10 * time.Second, FastIOFailTimeout: 5 * time.Second})
	if err != nil {
		return nil, err
	}
	return &nvmeDataPath{c: c, address: address, port: port}, nil
}

func (p *nvmeDataPath) describe() string {
	return fmt.Sprintf("NVMe/TCP to %s:%d", p.address, p.port)
}

func (p *nvmeDataPath) session(ctx context.Context, nqn, hostNQN string, flag int, fn func(*os.File) error) (err error) {
	dev, err := p.c.Connect(ctx, nvme.Target{Address: p.address, Port: p.port, NQN: nqn, HostNQN: hostNQN})
	if err != nil {
		return fmt.Errorf("connecting to %s over NVMe/TCP (%s:%d) as this run's host: %w", nqn, p.address, p.port, err)
	}
	defer func() {
		notInUse := func(context.Context, string) (bool, error) { return false, nil }
		if derr := p.c.Disconnect(context.WithoutCancel(ctx), nqn, notInUse); derr != nil {
			err = errors.Join(err, fmt.Errorf("disconnecting %s: %w", nqn, derr))
		}
	}()
	f, err := os.OpenFile(dev, flag, 0)
	if err != nil {
		return err
	}
	if err := fn(f); err != nil {
		f.Close()
		return fmt.Errorf("%s (%s): %w", dev, nqn, err)
	}
	return f.Close()
}

func (p *nvmeDataPath) write(ctx context.Context, nqn, hostNQN string, off int64, b []byte) error {
	return p.session(ctx, nqn, hostNQN, os.O_RDWR, func(f *os.File) error {
		if _, err := f.WriteAt(b, off); err != nil {
			return err
		}
		return f.Sync()
	})
}

func (p *nvmeDataPath) read(ctx context.Context, nqn, hostNQN string, off int64, n int) ([]byte, error) {
	b := make([]byte, n)
	err := p.session(ctx, nqn, hostNQN, os.O_RDONLY, func(f *os.File) error {
		_, err := f.ReadAt(b, off)
		return err
	})
	return b, err
}
