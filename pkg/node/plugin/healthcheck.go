package plugin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerpb "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
)

// Health services the probes ask for (grpc.health.v1 service names).
const (
	// HealthLiveness: both of the plugin's kubelet sockets answer.
	HealthLiveness = "liveness"
	// HealthReadiness (also "" and "startup"): alive, and the node's
	// ResourceSlices were published at least once.
	HealthReadiness = "readiness"
	HealthStartup   = "startup"
)

// healthServer answers the kubelet's gRPC probes by calling the plugin's
// own kubelet-facing sockets the way the kubelet does: GetInfo on the
// registration socket and an empty NodePrepareResources on the DRA
// socket. A plugin whose gRPC servers stopped, or whose sockets were
// removed from under it, is then reported not alive and restarted.
type healthServer struct {
	healthpb.UnimplementedHealthServer
	registrarSocket string
	draSocket       string
	published       func() bool
	server          *grpc.Server
	addr            net.Addr
	done            chan struct{}
}

// socketPaths are the sockets the plugin library creates (its naming,
// kubeletplugin.Start), with and without rolling updates.
func (o *Options) socketPaths() (registrar, dra string) {
	reg, sock := devicemodel.DriverName+"-reg.sock", "dra.sock"
	if o.PodUID != "" {
		reg = kubeletplugin.RollingUpdateRegistrarSocketFile(o.RegistrarDir, devicemodel.DriverName, types.UID(o.PodUID))
		sock = "dra-" + o.PodUID + ".sock"
	}
	return filepath.Join(o.RegistrarDir, reg), filepath.Join(o.PluginDataDir, sock)
}

// startHealthServer serves the health service on the TCP port (gRPC
// probes) and/or the Unix socket (exec probes: `kubelet-plugin --probe`).
// The socket lives in the container's own /tmp, so an old and a new plugin
// pod in the host network, side by side during a seamless upgrade, never
// compete for one port.
func startHealthServer(ctx context.Context, d *Driver) (*healthServer, error) {
	o := d.opts
	reg, dra := o.socketPaths()
	h := &healthServer{registrarSocket: reg, draSocket: dra, published: d.publisher.Published, done: make(chan struct{})}
	var listeners []net.Listener
	if o.HealthcheckPort >= 0 {
		lis, err := net.Listen("tcp", net.JoinHostPort(o.HealthcheckAddress, strconv.Itoa(o.HealthcheckPort)))
		if err != nil {
			return nil, fmt.Errorf("--healthcheck-port: %w", err)
		}
		h.addr = lis.Addr()
		listeners = append(listeners, lis)
	}
	if o.HealthcheckSocket != "" {
		if err := os.Remove(o.HealthcheckSocket); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("--healthcheck-socket: %w", err)
		}
		lis, err := net.Listen("unix", o.HealthcheckSocket)
		if err != nil {
			for _, l := range listeners {
				_ = l.Close()
			}
			return nil, fmt.Errorf("--healthcheck-socket: %w", err)
		}
		listeners = append(listeners, lis)
	}
	h.server = grpc.NewServer()
	healthpb.RegisterHealthServer(h.server, h)
	logger := klog.FromContext(ctx)
	var wg sync.WaitGroup
	for _, lis := range listeners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := h.server.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				logger.Error(err, "Health service stopped", "address", lis.Addr().String())
			}
		}()
		logger.Info("Serving gRPC health checks", "address", lis.Addr().String())
	}
	go func() {
		wg.Wait()
		close(h.done)
	}()
	return h, nil
}

func (h *healthServer) stop() {
	h.server.Stop()
	<-h.done
}

// Probe asks the health service on the Unix socket about a service, as an
// exec probe: nil when it is SERVING.
func Probe(ctx context.Context, socket, service string) error {
	if socket == "" {
		return fmt.Errorf("--probe needs --healthcheck-socket, the socket the plugin serves its health service on")
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := dialUnix(socket)
	if err != nil {
		return err
	}
	defer conn.Close()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		return fmt.Errorf("health service on %s: %w", socket, err)
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("%s: %s", service, resp.GetStatus())
	}
	return nil
}

// Check implements grpc.health.v1.Health.
func (h *healthServer) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	switch req.GetService() {
	case HealthLiveness, HealthReadiness, HealthStartup, "":
	default:
		return nil, status.Errorf(codes.NotFound, "unknown service %q: use %q, %q or %q", req.GetService(), HealthLiveness, HealthReadiness, HealthStartup)
	}
	logger := klog.FromContext(ctx)
	if err := h.alive(ctx); err != nil {
		logger.V(2).Info("Health check failed", "service", req.GetService(), "err", err)
		return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_NOT_SERVING}, nil
	}
	if req.GetService() != HealthLiveness && !h.published() {
		logger.V(2).Info("Not ready: ResourceSlices not published yet", "service", req.GetService())
		return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_NOT_SERVING}, nil
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

// alive calls both kubelet-facing services over their sockets.
func (h *healthServer) alive(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	reg, err := dialUnix(h.registrarSocket)
	if err != nil {
		return err
	}
	defer reg.Close()
	info, err := registerpb.NewRegistrationClient(reg).GetInfo(ctx, &registerpb.InfoRequest{})
	if err != nil {
		return fmt.Errorf("registration socket %s: %w", h.registrarSocket, err)
	}
	if info.Name != devicemodel.DriverName {
		return fmt.Errorf("registration socket %s serves driver %q", h.registrarSocket, info.Name)
	}
	dra, err := dialUnix(h.draSocket)
	if err != nil {
		return err
	}
	defer dra.Close()
	if _, err := drapb.NewDRAPluginClient(dra).NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{}); err != nil {
		return fmt.Errorf("DRA socket %s: %w", h.draSocket, err)
	}
	return nil
}

func dialUnix(path string) (*grpc.ClientConn, error) {
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", path, err)
	}
	return conn, nil
}
