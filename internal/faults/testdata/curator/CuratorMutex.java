// CuratorMutex holds a Curator InterProcessMutex, for the interoperability test (internal/faults): it takes the
// mutex on PATH (waiting at most WAIT_MS, 0 = a single try), prints "held <czxid of its node>" or "busy", then
// releases it when a line arrives on standard input and prints "released".
// Usage: java -cp CLASSPATH CuratorMutex.java SERVERS PATH WAIT_MS
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.concurrent.TimeUnit;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.RetryOneTime;

public class CuratorMutex {
    public static void main(String[] args) throws Exception {
        CuratorFramework client = CuratorFrameworkFactory.newClient(args[0], 10000, 10000, new RetryOneTime(100));
        client.start();
        client.blockUntilConnected(30, TimeUnit.SECONDS);
        InterProcessMutex mutex = new InterProcessMutex(client, args[1]);
        if (!mutex.acquire(Long.parseLong(args[2]), TimeUnit.MILLISECONDS)) {
            System.out.println("busy");
            client.close();
            return;
        }
        String node = mutex.getParticipantNodes().iterator().next();
        System.out.println("held " + client.checkExists().forPath(node).getCzxid() + " " + node);
        System.out.flush();
        new BufferedReader(new InputStreamReader(System.in)).readLine();
        mutex.release();
        System.out.println("released");
        System.out.flush();
        client.close();
    }
}
