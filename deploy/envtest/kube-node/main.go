// kube-node kubelet|kube-proxy|kube-scheduler|kube-controller-manager [flags]: one binary, a node.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	kcm "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	commands := map[string]func() *cobra.Command{
		"kubelet":                 func() *cobra.Command { return kubelet.NewKubeletCommand(context.Background()) },
		"kube-proxy":              func() *cobra.Command { return proxy.NewProxyCommand() },
		"kube-scheduler":          func() *cobra.Command { return scheduler.NewSchedulerCommand() },
		"kube-controller-manager": kcm.NewControllerManagerCommand,
	}
	if len(os.Args) < 2 || commands[os.Args[1]] == nil {
		fmt.Fprintln(os.Stderr, "usage: kube-node kubelet|kube-proxy|kube-scheduler|kube-controller-manager [flags]")
		os.Exit(2)
	}
	command := commands[os.Args[1]]()
	os.Args = append([]string{os.Args[1]}, os.Args[2:]...)
	os.Exit(cli.Run(command))
}
