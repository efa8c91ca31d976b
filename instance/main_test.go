package instance_test

import (
	"testing"

	"github.com/computeql/computeql/redistest"
)

var redisServer *redistest.Server

func TestMain(m *testing.M) { redistest.Main(m, &redisServer) }
